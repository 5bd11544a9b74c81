"""`make bench-peers`: Runifold against LangGraph, Google ADK and raw psycopg (see __main__)."""
