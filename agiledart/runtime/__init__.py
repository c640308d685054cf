"""A peer's application runtime: code store, records store, scheduler, app instances, data plane."""
