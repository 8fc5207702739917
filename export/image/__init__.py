"""Image captioning: composed emoji scenes, a Show-Attend-Tell captioner, its export and evaluation."""
