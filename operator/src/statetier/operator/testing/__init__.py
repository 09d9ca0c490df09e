"""Test and sandbox support for the operator: a Kubernetes API emulator and process helpers.

Nothing here runs in a cluster. It exists so that the operator's integration tests, ``make
sandbox`` and the apply->Deployment benchmark can run the real ``kopf run`` and the real
``kubectl`` on a laptop without an apiserver. It needs the ``testing`` extra (kmock).
"""
