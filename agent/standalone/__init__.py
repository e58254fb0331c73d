"""The standalone agent: its loop (`daemon`), `topolet exec` and `topolet status` (`launch`)."""
