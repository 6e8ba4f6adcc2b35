"""vLLM's KV connectors in the World: NixlConnector's scheduler side and pull-worker bookkeeping
(nixl.py) and the P/D glue between the engines (pd.py)."""
