"""The database seam: SQL files, migrations, and the engine calls the services make."""
