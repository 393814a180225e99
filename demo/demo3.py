# Demo 3: programmatic tool calling, as Hermes Agent's execute_code does it.
# The snippet writes a stub module, hermes_tools, whose functions call the
# caller's tool server (internal/testrig/cmd/toolserver) over the Unix socket that
# HERMES_RPC_SOCKET names: one connection per call, {"tool", "args"} as a JSON
# line out, one JSON answer back. Then it calls the tools 20 times in a loop
# and prints one line, all the caller's model would read of them:
#
#   warmest of 10 cities: Hanoi, 29 C, sunny; top result: https://wiki.example/hanoi-travel (20 tool calls)
#
# Each call is a connection: 20, under the 50 that flmbox run --callback
# forwards per call. DEMO3_DIR (default /tmp) is where the stub is written.
import os, sys

STUB = r'''
import json, os, socket

def _call(tool, args):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(os.environ["HERMES_RPC_SOCKET"])
        answer = b""
        try:
            s.sendall(json.dumps({"tool": tool, "args": args}).encode() + b"\n")
            while chunk := s.recv(65536):
                answer += chunk
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed early: what came, if anything, is the answer
    if not answer:
        raise RuntimeError("tool call refused: the connection closed without an answer")
    result = json.loads(answer)
    if "error" in result:
        raise RuntimeError(f"tool {tool} failed: {result['error']}")
    return result

def search(query):
    return _call("search", {"query": query})["results"]

def weather(city):
    return _call("weather", {"city": city})
'''

stub_dir = os.environ.get("DEMO3_DIR", "/tmp")
with open(os.path.join(stub_dir, "hermes_tools.py"), "w") as f:
    f.write(STUB)
sys.path.insert(0, stub_dir)
from hermes_tools import search, weather

cities = ["Lisbon", "Oslo", "Nairobi", "Lima", "Hanoi",
          "Quito", "Cairo", "Reykjavik", "Singapore", "Montreal"]
best = None
for city in cities:
    w = weather(city)
    top = search(f"{city} travel")[0]
    if best is None or w["temp_c"] > best[0]["temp_c"]:
        best = (w, top)
w, top = best
print(f"warmest of {len(cities)} cities: {w['city']}, {w['temp_c']} C, {w['conditions']}; "
      f"top result: {top['url']} ({2 * len(cities)} tool calls)")
