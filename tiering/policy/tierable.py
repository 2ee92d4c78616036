"""Which topics are never tiered, whatever the metadata says.

``tiering topic enable`` refuses them and the sidecar's loop skips them (logged once), so an older
version's record, or one written by hand, cannot make the sidecar copy or trim them:

- the metadata WAL (``metadata_topic``, whatever it is named): the tool would trim its own log;
- names starting ``__``: Kafka's internal topics (``__consumer_offsets``, ``__transaction_state``,
  ``__share_group_state``, ``__cluster_metadata``, KIP-405's ``__remote_log_metadata``) and the
  convention other tools follow for theirs;
- Kafka Streams' internal topics by their suffixes (``-changelog``, ``-repartition`` and the foreign-key
  join's ``-subscription-registration-topic`` / ``-subscription-response-topic``), whatever their
  cleanup.policy: Streams reads them with plain consumers (a store restores from its changelog's
  start) and purges repartition topics itself, so trimmed local data would be lost to it;
- compacted topics (KIP-405 does not tier them either). Kafka Connect's config, offset and status
  topics (``connect-configs``, ``connect-offsets``, ``connect-status`` by default, any name a worker
  gives them) are among them: a worker refuses to use them unless their cleanup.policy is compact.
"""

from __future__ import annotations

import re

from tiering_core.kafka_cluster import TopicInfo

_STREAMS_INTERNAL = re.compile(r"-(changelog|repartition)$|-subscription-(registration|response)(-\d+)?-topic$",
                               re.IGNORECASE)  # fmt: skip


def name_refusal(name: str, metadata_topic: str) -> str | None:
    """Why a topic of this name is never tiered (one line), or None: the rules that need only its name."""
    if name == metadata_topic:
        return f"cannot tier {name}: it is the tiering metadata WAL (metadata_topic); the tool never tiers its own log"
    if name.startswith("__"):
        return f"cannot tier {name}: it is an internal topic (names starting with __ belong to Kafka and its tools)"
    if _STREAMS_INTERNAL.search(name):
        return (f"cannot tier {name}: it is named as a Kafka Streams internal topic (-changelog, -repartition, "
                "-subscription-*-topic), which Streams reads from its start and purges itself")  # fmt: skip
    return None


def refusal(info: TopicInfo, metadata_topic: str) -> str | None:
    """Why the topic is never tiered (one line), or None: its name, then its cleanup.policy."""
    reason = name_refusal(info.name, metadata_topic)
    if reason is None and info.compacted:
        reason = (f"cannot tier {info.name}: it has cleanup.policy={info.configs.get('cleanup.policy')}, and "
                  "compacted topics cannot be tiered (Kafka's KIP-405 does not support them either)")  # fmt: skip
    return reason
