"""The REST API (FastAPI) under ``/api/v1``: it reads and writes through ``autotune``
and holds no state of its own."""
