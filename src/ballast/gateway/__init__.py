"""The gateway: one client-facing address in front of every broker (`ballast gateway`).

Clients connect once; the gateway follows topic ownership in the store (`routes`), sends
producers' messages to owners over batched links and carries consumers across moves and
failovers (`sessions`), so a move is a pause, not an error.

Run by: `ballast gateway` (`cli/gateway.py`).
May import: `ballast.wire`, `ballast.metadata`, `ballast.model`, `ballast.config` and the
standard helpers — never the broker's data plane (`ballast.broker`), the registry or the
cluster shell: what both sides of a link share lives in `ballast.wire`.
"""
