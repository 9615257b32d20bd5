"""HTTP scoring server (FastAPI + uvicorn) over the library scorer."""
