"""livevec's online learner, Kafka plumbing, front end and command line.

The parameter-server protocol lives in the sibling package ``ps_bridge``; everything
here is a client of it.
"""
__version__ = "0.1.0"
