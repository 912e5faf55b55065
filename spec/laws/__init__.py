"""The laws, one module per family; :data:`spec.registry.LAW_MODULES` lists them."""
