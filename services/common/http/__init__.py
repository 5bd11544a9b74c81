"""The HTTP port (RUNIFOLD_HTTP_LISTEN): the same services over Connect, gRPC-Web and plain
HTTP JSON, from the same servicers, contract, authentication, namespace rules, limits and
error reasons as gRPC, and the web console (docs/console.md).

- settings.py: HttpSettings, read once from the environment
- bridge.py: the servicers behind the guard, in the generated Connect applications
- errors.py: domain errors as Connect errors (ErrorInfo, RetryInfo, ... in the details)
- console.py: the console's static files and its two JSON endpoints
- listener.py: the ASGI routing, CORS, and uvicorn in the server's event loop
- port.py: all of it put together for a server process

Importing this package imports nothing of the above (server.py imports port.py when a
process serves HTTP).
"""
