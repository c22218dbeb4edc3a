"""The Python client: what researchers use, and what the CLI is built on.

    from broker.client import Client
    with Client() as c:                       # URL from SPILLWAY_REDIS_URL or the config file
        job = c.submit(command="python train.py", gpus=4, gpu_types=["A100"], priority="high")
        c.wait(job.id, timeout=3600)
        for line in c.logs(job.id):
            print(line.text)

Every method returns frozen, typed values (:class:`Job`, :class:`Explanation`,
:class:`NodeView`). Bad input raises :class:`~broker.errors.SpecError` naming each field, and
nothing is stored.

* :mod:`broker.client.core`: the :class:`Client`;
* :mod:`broker.client.transport`: the one interface its calls go through, with two of them:
  :mod:`broker.client.local` (the cluster's Redis) and :mod:`broker.client.https` (an API
  server, through :mod:`broker.api.remote`);
* :mod:`broker.client.views`: :class:`Explanation`, :class:`NodeView`, :class:`JobTimeout`;
* :mod:`broker.client.inputs`: the URL, state filters, specs and workdirs as given.
"""

from broker.client.core import Client
from broker.client.inputs import StateFilter, merged, parse_states, resolve_url, submit_workdir
from broker.client.views import Explanation, JobTimeout, NodeView

__all__ = ["Client", "Explanation", "JobTimeout", "NodeView", "StateFilter", "merged",
           "parse_states", "resolve_url", "submit_workdir"]
