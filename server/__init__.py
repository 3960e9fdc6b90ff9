"""The edge server: an aiohttp app whose runtime runs the scheduler's plans on the executor."""
