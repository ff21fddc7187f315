"""The floor every other part stands on: the catalog's and bucket's layout, errors, validation,
the deadline policy, the fleet state, the spend ledger and prices. Standard library and boto3
only: the interruption handler's Lambda zip packs this package whole, and machines, on-call
laptops and the CLI share it. Nothing here imports a module above it (tests/test_layout.py).
"""
