pytest_plugins = ["tests.fixtures.services", "tests.fixtures.coordinator"]
