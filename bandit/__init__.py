"""agiledart.bandit"""
