"""The floor that drives the others for a user: Terraform (`terraform`, `deploy`), checkov
(`scan`), the rehearsals on the local cloud, and a machine's log shipper. Above the core and
the trainer, constructs, stacks, cost and local cloud; below the command line, which is the
only thing that imports it (tests/test_layout.py).
"""
