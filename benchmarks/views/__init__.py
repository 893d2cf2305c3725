"""What is drawn from every scenario's stored numbers: the targets table and the plots."""
