"""Connectors that let inference engines use a ctxpod pod through their own plugin
mechanisms, with configuration alone (docs/INTEGRATIONS.md):

- :mod:`ctxpod.integrations.lmcache`: an LMCache remote storage plugin;
- :mod:`ctxpod.integrations.sglang`: SGLang's HiCache ``dynamic`` storage backend;
- :mod:`ctxpod.integrations.vllm`: a secondary tier of vLLM's ``OffloadingConnector``.

Each module imports its engine, so import only the one the engine names; the engines load
them by module path from their configuration.
"""
