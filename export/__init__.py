"""attnserve.export"""
