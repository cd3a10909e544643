"""`ddptop lab`: an emulated cluster on one machine (namespaces, a bridge, shaped links, CPU quotas, teardown)."""
