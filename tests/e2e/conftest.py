# The `stack` and `private_stack` fixtures live in tests/conftest.py so every test package can use them.
