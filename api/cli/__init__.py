"""The ``dhp`` command line: the top layer, which may import every other part."""
