"""ps-lite, in Python over pyzmq, wire-compatible with dmlc/ps-lite (C++).

Layering follows ps-lite: the Postoffice knows who is in the cluster, the Van moves
bytes on sockets, and the apps (KVWorker, KVServer, SimpleApp) sit on top.
"""
