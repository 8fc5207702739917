"""attnserve.server"""
