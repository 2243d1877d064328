"""The problem model: cluster, model, batch, options, the allowed group sizes, and the input documents
that build them. Pure and frozen: every object is validated when it is made."""
