"""Deployment: the cluster topology (one source of truth), its Marathon and Kubernetes
renderings, and a local runner that starts a Marathon group on one machine."""
