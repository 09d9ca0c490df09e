"""The Kubernetes test environment of the operator: an API emulator and process helpers.

Nothing here runs in a cluster, so none of it ships in the operator's package or image. It
exists so that the operator's integration tests, ``make sandbox`` and the apply->Deployment
benchmark can run the real ``kopf run`` and the real ``kubectl`` on a laptop without an
apiserver. ``statetier-operator sandbox`` and ``statetier-operator bench`` find their commands
through the ``statetier_operator.commands`` entry points this distribution declares.
"""
