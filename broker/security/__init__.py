"""Security: Redis ACL users per component (:mod:`broker.security.acl`), keeping secrets out
of logs, output and job environments (:mod:`broker.security.redact`). docs/security.md."""
