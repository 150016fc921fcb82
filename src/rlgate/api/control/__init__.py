"""Control routes: sessions, rewards, capacity, export, weight updates, health, models."""
