"""The cluster roles: parameter server, worker and scheduler, on top of ps-lite.

Owns livevec's commands over ps-lite (``ps_commands``: command numbers and payloads), the
server that answers them from a model shard, the worker that trains Kafka batches against
the servers, and the scheduler. Checkpointing plugs in through the extension points the
server and the worker take in their constructors; the roles never import it.

May import: ``online.learner``, ``online.stream`` and ``ps_bridge``.
"""
