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

With -e, a private queue (exclusive, auto-delete, named by the server) is bound
to the exchange with the binding key for as long as the command runs. Each
message is printed (and stdout flushed) before it is acked.
"""

DECLARE_EPILOG = """\
examples:
  amqlite declare exchange events topic --durable
  amqlite declare queue jobs --durable
  amqlite declare queue audit --type stream --arg x-max-length=100000
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
  amqlite status -s 127.0.0.1:5555,127.0.0.1:5556 --json | jq '.vhosts[].queues'
"""

PASSWD_EPILOG = """\
examples:
  amqlite passwd                       # asks twice, prints the hash
  echo -n 's3cret' | amqlite passwd --stdin

Put the printed hash in the config file as the user's password_hash.
"""

MAIN_EPILOG = """\
examples:
  amqlite server
  amqlite declare queue jobs --durable
  amqlite publish -k jobs --confirm --count 5 'job {n}'
  amqlite consume -q jobs --count 5
  amqlite status

Run "amqlite COMMAND --help" for each command's options.
"""
