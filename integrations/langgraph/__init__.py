"""tiermem as a LangGraph store: ``TiermemStore``."""
