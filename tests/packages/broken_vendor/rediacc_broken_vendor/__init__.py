"""A plugin whose import fails, to prove `rdc` reports it instead of crashing."""

raise ImportError("this plugin needs libexample.so.1, which is not installed")
