"""The thin Django project that runs plurkcore, plurkweb and the stack runner."""
