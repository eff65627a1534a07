"""STaR's successors as star-engine plugins (the verifier of V-STaR is the core's ``[verifier]``)."""
