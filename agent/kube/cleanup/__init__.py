"""Taking topolet off nodes: what `topolet cleanup` removes from the API and from the host."""
