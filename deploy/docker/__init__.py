"""`make up` on a Docker host: images, the compose project, and the helpers that run inside the containers."""
