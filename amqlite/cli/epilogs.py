"""The examples printed at the end of ``--help``, one block per command."""

PUBLISH_EPILOG = """\
examples:
  amqlite publish -k jobs 'hello'                       # default exchange -> queue "jobs"
  amqlite publish -e events -k orders.eu -H region=eu '{"id": 7}'
  amqlite publish -k jobs --confirm --count 1000 'job {n}'
  amqlite publish -e logs --rate 200 --count 2000 'tick {n}'
  tail -f app.log | amqlite publish -e logs -k app -   # one message per line

Prints "published N" (with --confirm: "published N confirmed M") on stderr and
exits 1 unless every message was sent and, with --confirm, confirmed. With
--mandatory, messages no queue takes come back and are counted as returned.
"""

CONSUME_EPILOG = """\
examples:
  amqlite consume -q jobs                      # until Ctrl-C
  amqlite consume -q jobs --count 10 --timeout 5
  amqlite consume -e events -k 'orders.#' --json
  amqlite consume -q orders --selector "region = 'eu' AND priority > 4"
  amqlite consume -q audit --offset first --timeout 1     # a stream, from its oldest
  amqlite consume -q audit --offset 2026-11-22T10:00:00Z --json   # offsets included
  amqlite consume -q audit --name billing                 # resume where billing stopped

With -e, a private queue (exclusive, auto-delete, named by the server) is bound
to the exchange with the binding key for as long as the command runs. Each
message is printed (and stdout flushed) before it is acked.

A stream queue keeps its messages: --offset says where to start (first, last,
next, an offset or an ISO-8601 time; the default is next). With --name the
command starts after the offset stored under NAME (or at --offset, by default
first, when none is) and stores the offset of what it printed under NAME every
100 messages and when it stops, so the next run goes on from there.
"""

DECLARE_EPILOG = """\
examples:
  amqlite declare exchange events topic --durable
  amqlite declare queue jobs --durable
  amqlite declare queue audit --type stream --max-age 7D --max-length-bytes 1000000000
  amqlite declare queue capped --type stream --arg x-max-length=100000

A stream queue (--type stream) is an append-only log read by offset (see
"amqlite consume --help"); it is always durable and keeps messages until
--max-age, --max-length-bytes or x-max-length drops the oldest.
"""

BIND_EPILOG = """\
examples:
  amqlite bind events eu-orders 'orders.eu.*'
  amqlite bind logs everything                  # fanout: no key
  amqlite bind tagged q '' --arg x-match=all --arg region=eu
"""

STATUS_EPILOG = """\
examples:
  amqlite status
  amqlite status --json | jq -r '.queues[] | "\\(.vhost) \\(.name) \\(.messages)"'
  amqlite status -s 127.0.0.1:5555,127.0.0.1:6666 --json | jq '.nodes[] | {node_id, state}'

--json prints one of two shapes:
  one server (-s a)      the node's status map: node_id, state, version, uptime_s,
                         listen, tls (docs/tls.md), data_dir, connections, links,
                         storage, ha (an HA node), vhosts (each with its
                         exchanges and queues) and queues (every vhost's queues
                         in one list, each with its vhost); an unreachable
                         server is an error (exit 1)
  several (-s a,b,...)   {"nodes": [...]}: one status map per server, in the order
                         given, or {"address": ..., "error": ...} for one that did
                         not answer (exit 1 only when none did)
"""

PASSWD_EPILOG = """\
examples:
  amqlite passwd                       # asks twice, prints the hash
  echo -n 's3cret' | amqlite passwd --stdin
  amqlite passwd --user ops --tags monitoring    # a whole [[users]] entry

Put the printed hash in the config file as the user's password_hash. Tags grant
the node's privileged actions: administrator (switchover, trace on/off; implies
monitoring, management, peering), monitoring (the full status), management,
cluster (the HA peer link's login), peering (an exchange peering link's login).
"""

MAIN_EPILOG = """\
examples:
  amqlite server
  amqlite declare queue jobs --durable
  amqlite publish -k jobs --confirm --count 5 'job {n}'
  amqlite consume -q jobs --count 5
  amqlite declare queue audit --type stream --max-age 7D
  amqlite consume -q audit --offset first --name reader
  amqlite status

Run "amqlite COMMAND --help" for each command's options.
"""
