"""The demos of ``statetier demo``: a streaming word count on Spark (:mod:`.spark`) and one
through the local runner (:mod:`.local`), each in a working directory of its own
(:mod:`.workdir`)."""
