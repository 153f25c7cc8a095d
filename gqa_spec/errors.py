"""The one exception type for bad user input: the CLI prints its message on one line, no traceback."""


class UserError(ValueError):
  """Bad input named precisely: wrong shapes, unknown task, missing or corrupt checkpoint, bad gin."""
