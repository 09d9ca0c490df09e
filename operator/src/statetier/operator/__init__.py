"""Kubernetes operator for statetier, built on kopf.

It gives opted-in SparkApplications spill volumes and backend configuration through a mutating
admission webhook, and runs CompactionService resources. The configuration keys it writes are the
backend's own schema (:mod:`statetier.backend.config`), never a copy of it.
"""
