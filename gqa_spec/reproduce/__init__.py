"""The main job: the papers' tables and figures at CPU scale (`gqa-spec reproduce`)."""
