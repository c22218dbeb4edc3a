"""The control plane's processes: the control loop, leader election, the reconciler, and the
embedded cluster (spillway up / demo)."""
