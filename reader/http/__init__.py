"""The HTTP fetch service (``tiering reader serve``): records of tiered topics by topic, partition and offset.

Stateless: an instance holds only the metadata catalog and caches, so several run behind a load
balancer and a client continues at the next offset on any of them.

- ``GET /v1/topics/{topic}/partitions/{partition}/batches?offset=N``: raw record batches
  (``application/octet-stream``, any Kafka client library decodes them), offsets in ``Kafka-*`` headers.
- ``GET /v1/topics/{topic}/partitions/{partition}/records?offset=N``: decoded records as JSON.
- ``GET /v1/topics/{topic}/partitions/{partition}``: remote start/end and the broker's log start/end.
- ``/healthz``, ``/readyz``, ``/metrics`` (Prometheus), ``/openapi.json``.

Modules: ``config`` (settings), ``service`` (a fetch filtered by isolation level, no HTTP), ``records``
(JSON), ``errors`` (status codes and bodies), ``auth`` (bearer tokens), ``metrics``, ``app`` (routes),
``server`` (uvicorn).
"""

from reader.http.app import create_app
from reader.http.config import HttpSettings, ServiceSettings, load_service_settings
from reader.http.server import serve
from reader.http.service import FetchService, Page

__all__ = ["FetchService", "HttpSettings", "Page", "ServiceSettings", "create_app", "load_service_settings", "serve"]
