"""brokermgr"""
