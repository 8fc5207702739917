"""attnserve.clients"""
