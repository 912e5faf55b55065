"""The laws, one module per family; `spec.registry.LAW_MODULES` lists them."""
