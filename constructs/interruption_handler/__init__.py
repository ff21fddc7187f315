"""The interruption handler: its construct (construct.py) and the Lambda code (handler.py)."""
