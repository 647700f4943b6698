"""`localchat serve`: the engine behind an OpenAI-compatible HTTP API (Starlette on uvicorn)."""
