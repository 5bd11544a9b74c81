"""What tests of every service share: servers on loopback and the whole system in one
server (stack.py), a service as its own process (process.py), calls over gRPC and over the
HTTP port (grpc_calls.py, http_calls.py), a fake OpenAI-compatible model server
(fake_openai.py), a proxy that holds a reply (held.py), the command-line tools
(tools.py), settings of a server under test (settings.py) and polling with a deadline
(waiting.py)."""
