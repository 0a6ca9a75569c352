"""The web console: static assets built from console/ (scripts/build-console), a login
that keeps the API key on the server, and a same-origin path to the HTTP API."""
