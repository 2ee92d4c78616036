"""Which port stands for which broker, and the responses that carry broker addresses, rewritten.

Clients bootstrap to the proxy's bootstrap port; every address a response gives them is the proxy's
advertised host with the port that stands for that broker (``broker_ports``, else ``broker_port_base``
plus the node id), so they always come back through the proxy. Every instance derives the same ports
from the same configuration, so several instances behind one address (a Kubernetes Service) give the
same answers and a client may reach any of them. The brokers' own addresses are learned from the
Metadata responses passing through (and asked of the cluster when a client connects to a broker the
instance has not seen in a response yet, after a restart).

Rewritten: Metadata, FindCoordinator (v0-3 top-level fields, v4+ ``coordinators``), DescribeCluster
(broker endpoints; controller endpoints are left alone) and the ``node_endpoints`` of Produce v10+ and
Fetch v16+ (KIP-951: the new leader's address comes with a NOT_LEADER error).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32

from tiering_core.errors import ConfigError

METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER, PRODUCE, FETCH = 3, 10, 60, 0, 1
REWRITTEN = frozenset({METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER})


class Router:
    """Node id <-> proxy port, and node id -> the broker's own address. Thread-safe."""

    def __init__(self, advertised_host: str, broker_ports: dict[int, int], port_base: int | None,
                 bootstrap: list[tuple[str, int]]) -> None:  # fmt: skip
        self.advertised_host = advertised_host
        self.broker_ports = dict(broker_ports)
        self.port_base = port_base
        self.bootstrap = bootstrap
        self._brokers: dict[int, tuple[str, int]] = {}
        self.unavailable: set[int] = set()  # nodes with no port, or whose listener could not start
        self._lock = threading.Lock()
        self.on_new_node: Callable[[int], None] | None = None  # the server starts that node's listener

    def has_port(self, node_id: int) -> bool:
        return node_id in self.broker_ports or self.port_base is not None

    def port_for(self, node_id: int) -> int:
        """The proxy's port for ``node_id``. ConfigError when the configuration has none for it."""
        port = self.broker_ports.get(node_id)
        if port is None and self.port_base is not None:
            port = self.port_base + node_id
        if port is None:
            raise ConfigError(f"no proxy port for broker {node_id}: add it to broker_ports or set broker_port_base")
        return port

    def learn(self, node_id: int, host: str, port: int) -> None:
        with self._lock:
            new = node_id not in self._brokers
            self._brokers[node_id] = (host, port)
        if new and self.on_new_node is not None:
            self.on_new_node(node_id)

    def broker_address(self, node_id: int) -> tuple[str, int] | None:
        with self._lock:
            return self._brokers.get(node_id)

    def known_nodes(self) -> list[int]:
        with self._lock:
            return sorted(self._brokers)

    # -- rewriting ------------------------------------------------------------------------------
    def _endpoint(self, entity: Any, id_field: str = "node_id") -> Any | None:
        """The entity pointing at the proxy's port for its node; None for a node the proxy has no listener for
        (left out: clients see its partitions without a reachable leader, a retriable state)."""
        node = int(getattr(entity, id_field))
        if node < 0:
            return entity  # "no coordinator" / unknown leader: nothing to point at
        address = self.address_for(node, entity.host, int(entity.port))
        return None if address is None else dataclasses.replace(entity, host=address[0], port=i32(address[1]))

    def address_for(self, node: int, host: str, port: int) -> tuple[str, int] | None:
        """The proxy's address for a broker a client is told about (learned on the way); None for a node the
        proxy has no listener for."""
        self.learn(node, host, port)
        if node in self.unavailable:
            return None
        return self.advertised_host, self.port_for(node)

    def _endpoints(self, entities: Any, id_field: str = "node_id") -> tuple[Any, ...]:
        return tuple(e for e in (self._endpoint(x, id_field) for x in entities) if e is not None)

    def _coordinator(self, entity: Any) -> Any:
        """A coordinator the proxy cannot route to: COORDINATOR_NOT_AVAILABLE, which clients retry."""
        found = self._endpoint(entity)
        if found is not None:
            return found
        return dataclasses.replace(entity, error_code=ErrorCode.coordinator_not_available, node_id=i32(-1), host="",
                                   port=i32(-1))  # fmt: skip

    def rewrite(self, api_key: int, body: Any) -> Any:
        """The response body with every broker address replaced by the proxy's (others unchanged)."""
        if api_key == METADATA:
            return dataclasses.replace(body, brokers=self._endpoints(body.brokers))
        if api_key == FIND_COORDINATOR:
            if hasattr(body, "coordinators"):
                return dataclasses.replace(body, coordinators=tuple(self._coordinator(c) for c in body.coordinators))
            return self._coordinator(body)
        if api_key == DESCRIBE_CLUSTER:
            if getattr(body, "endpoint_type", 1) != 1:
                return body  # controller endpoints (bootstrap.controllers clients): not the proxy's to rewrite
            return dataclasses.replace(body, brokers=self._endpoints(body.brokers, "broker_id"))
        if api_key in (PRODUCE, FETCH) and getattr(body, "node_endpoints", ()):
            return dataclasses.replace(body, node_endpoints=self._endpoints(body.node_endpoints))
        return body
