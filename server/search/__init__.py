"""The read path: ranking memories for a query. ``searcher.Searcher`` is the entry point; it ranks
over a ``source.SearchSource`` (the engine's state) and imports nothing above this layer."""
