"""An active-active cluster of leveret nodes on one PostgreSQL store (docs/cluster.md).

``leveret server --store postgresql://… --cluster NAME --node NODE`` starts an active node.
Every node accepts any client; each queue has one owner node at a time, recorded in
PostgreSQL; metadata (vhosts, users, permissions, exchanges, bindings, policies,
parameters) is shared through the store and applied by every node before a change's -ok.

- :mod:`.catalog`: membership, liveness, queue ownership and the change log, in the
  cluster's schema (blocking calls, off the event loop);
- :mod:`.replication`: definition changes written with the node's store batch, and
  applied on every other node (LISTEN/NOTIFY, polling as a fallback);
- :mod:`.peers` and :mod:`.owner`: the links between nodes (AMQP itself, leveret's own
  client) that carry publishes to a queue's owner and a remote queue's deliveries back;
- :mod:`.takeover`: survivors take a dead or fenced node's queues over, restoring them
  from the shared store (:mod:`.restore`);
- :mod:`.lease`: a node cut off from the database stops serving within its lease;
- :mod:`.node`: :class:`~.node.ClusterNode`, which starts and stops all of it.

Fencing: a node's store writer session holds the node's PostgreSQL advisory lock, every
write goes through that session, and a node whose session went stops serving (as a
fenced master does); catalog writes on other sessions check the writer's pid in SQL.
"""
