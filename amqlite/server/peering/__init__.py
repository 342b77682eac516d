"""Exchange peering's trio shell: drives the sans-IO core of :mod:`amqlite.peering`
(docs/peering.md, "Shell integration").

- :mod:`.service`: :class:`PeeringService`, one per node: owns the tasks (dials,
  timer, flusher), the peered exchanges, activation on a standalone or active
  node, the accepted link connections, ``status``;
- :mod:`.transport`: the link connections (the dialer's side: dial, hello, reader
  and writer);
- :mod:`.applier`: applies the core's actions to the broker and the links
  (deliver into the local exchange, confirm once safe, settle, resume held);
- :mod:`.durability`: the epoch counter, receive marks, durable sending logs,
  spill files and the durability barrier;
- :mod:`.hooks`: the dispatcher's publish hook and the exchange's binding watcher;
- :mod:`.peering_queue`: the durable peering queues behind subscribe links;
- :mod:`.registry`: the link ends and what is kept beside each;
- :mod:`.spill`: the disk spill store of ``overflow = "spill"`` links.
"""

from .hooks import PublishHook
from .peering_queue import PeeringQueue
from .service import PeeringService

__all__ = ["PeeringQueue", "PeeringService", "PublishHook"]
